"""homegpu.tui.app: the Textual app: the main screen (`main`), its dialogs, widgets, styles and the controller it drives."""
