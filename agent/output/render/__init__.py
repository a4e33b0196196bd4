"""Renderings of a report document: text, markdown, HTML."""
