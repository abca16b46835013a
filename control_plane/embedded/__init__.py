"""The embedded platform (`platform up`): every part real, on loopback, under one state dir."""
