"""homegpu.trainer: runs on the nodes with TensorFlow only; imports nothing from remote/ or tui/."""

MODELS = ("cnn", "resnet")  # the built-in models (models.py builds them; the controller validates `model` with it)
