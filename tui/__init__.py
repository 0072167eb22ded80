"""homegpu.tui: the front ends (CLI, Textual app, headless runner). No asyncssh or docker imports."""
