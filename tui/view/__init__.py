"""homegpu.tui.view: what both front ends show, pure: the view model and its text and Rich renderings (no Textual)."""
