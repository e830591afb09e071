"""`reason models`: pull and list the catalog's models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.pull import pull as pull_model
from services import catalog
from services.settings import default_cache_dir

models_app = typer.Typer(help="Pull and list the models of the catalog.", no_args_is_help=True)

CacheDir = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Where models are kept (default: $REASON_CACHE_DIR or ~/.cache/reason).",
    ),
]


def serving_models() -> list[str]:
    """The catalog models this environment's PLANNER_* and VERIFIER_* settings serve, each
    once: the planner's on the llama.cpp backend (a path in PLANNER_MODEL or
    PLANNER_MODEL_PATH is not pulled), and the verifier's base model on the model backend."""
    from services.settings import PlannerSettings, VerifierSettings

    names: list[str] = []
    planner = PlannerSettings()
    if (
        planner.backend == "llamacpp"
        and planner.model_path is None
        and planner.model in catalog.MODELS
    ):
        names.append(planner.model)
    verifier = VerifierSettings()
    if verifier.backend == "model" and verifier.base_model in catalog.MODELS:
        names.append(verifier.base_model)
    return list(dict.fromkeys(names))


@models_app.command("pull")
def pull(
    name: Annotated[
        str | None, typer.Argument(help="Catalog name, e.g. qwen2.5-coder-0.5b-instruct")
    ] = None,
    serving: Annotated[
        bool,
        typer.Option(
            "--serving",
            help="Pull what the PLANNER_* and VERIFIER_* settings of this environment serve.",
        ),
    ] = False,
    cache_dir: CacheDir = None,
) -> None:
    """Download a model's packages, assemble its file and verify its sha256."""
    console = Console(stderr=True)
    if (name is None) == (not serving):
        console.print("[red]error:[/red] give a catalog name or --serving, not both")
        raise typer.Exit(2)
    try:  # every name is checked before anything is downloaded
        models = {n: catalog.get(n) for n in (serving_models() if serving else [str(name)])}
    except (catalog.UnknownModel, ValueError) as exc:  # ValueError: a bad setting
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    for model_name, model in models.items():
        pull_one(model_name, model, cache_dir, console)


def pull_one(
    name: str, model: catalog.CatalogModel, cache_dir: Path | None, console: Console
) -> None:
    with console.status(f"pulling {name}") as status:

        def progress(message: str) -> None:
            status.update(message)
            console.log(message)

        try:
            file = pull_model(name, cache_dir=cache_dir, progress=progress)
        except catalog.CatalogError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None
    out = Console()
    out.print(f"{name}: {file}")
    out.print(f"sha256 {model.sha256} (verified)")


@models_app.command("list")
def list_models(cache_dir: CacheDir = None) -> None:
    """Show every catalog model, its packages and whether it is pulled."""
    root = cache_dir or default_cache_dir()
    table = Table(title=f"models in {root / 'models'}")
    table.add_column("name", style="bold")
    table.add_column("packages")
    table.add_column("pulled")
    table.add_column("path")
    for name, model in sorted(catalog.MODELS.items()):
        pulled = catalog.is_pulled(name, root)
        packages = model.packages
        shown = packages[0] if len(packages) == 1 else f"{packages[0]} … ({len(packages)} parts)"
        table.add_row(
            name,
            shown,
            "[green]yes[/green]" if pulled else "no",
            str(catalog.model_dir(name, root) / model.filename) if pulled else "",
        )
    Console().print(table)
