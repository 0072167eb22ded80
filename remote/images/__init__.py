"""homegpu.remote.images: the workers' Docker images on the nodes: built there from assets/Dockerfile, or copied node to
node in a chain with no registry.
"""
