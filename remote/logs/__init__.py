"""homegpu.remote.logs: a worker's output followed on its node across reconnects, turned into the lines a terminal would
show, each line classified once (a metric, Keras's own progress, TensorFlow's harmless notices, text).
"""
