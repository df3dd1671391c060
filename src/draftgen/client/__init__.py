"""Talking to inference servers: one client per server, what a server is and accepts, its metrics and its clock."""
