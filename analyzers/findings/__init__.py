"""Finders, one module per catalogue family; each reads the one analysis context."""
