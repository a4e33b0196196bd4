"""The one analysis context every finder reads."""
