"""homegpu.tui.web: the terminal UI in a browser (textual-serve) behind a token and an Origin check.

Importing this package loads nothing heavy: aiohttp and textual-serve load with `server` only.
"""

WEB_TOKEN_ENV = "HOMEGPU_WEB_TOKEN"  # a web view's token of your own; never passed on to its apps
