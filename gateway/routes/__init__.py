"""Thin HTTP handlers: parse → call a service → render. Only this package knows FastAPI."""
