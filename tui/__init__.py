"""homegpu.tui: the front ends: the command line (cli/), the Textual app (app/), the browser view (web/), what they
all show (view/) and serve's wiring (daemon.py). No asyncssh or docker imports."""
