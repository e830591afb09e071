"""Data the tools ship: the SQL sample database seed and the lookup knowledge base."""
