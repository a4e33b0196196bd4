"""The agent's end of the in-process hooks: the private channel the job's hooks write to."""
