"""A distributed job's local ranks inside one session: launch, GPUs, stacks, the hang watcher."""
