"""Parameters read through a property, shared by SimpleFSDP and ChannelParallel."""
