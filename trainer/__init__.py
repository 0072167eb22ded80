"""homegpu.trainer: runs on the nodes with TensorFlow only; imports nothing from remote/ or tui/."""

MODELS = ("cnn", "resnet")  # the built-in models (models.py builds them; the controller validates `model` with it)
# The PyTorch demo's (torch_demo.py), its default first: an MLP whose steps are short, and a CNN whose compute outlasts
# the all-reduce on a home LAN (where splitting a step by speed pays)
TORCH_DEMO_MODELS = ("mlp", "cnn")
