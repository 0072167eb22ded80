"""homegpu.remote: everything that talks to the nodes (no UI imports here)."""
