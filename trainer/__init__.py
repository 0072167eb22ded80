"""homegpu.trainer: runs on the nodes with TensorFlow only; imports nothing from remote/ or tui/."""
