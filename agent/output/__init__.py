"""What a session leaves: the report and its schema, the session result, recordings, exports."""
