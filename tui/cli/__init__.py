"""homegpu.tui.cli: the `homegpu` command line: the parser (`main`), one module per command family, the headless runner."""
