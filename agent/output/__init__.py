"""What a session leaves: the report document and its schema, recordings, exports, safe file I/O."""
