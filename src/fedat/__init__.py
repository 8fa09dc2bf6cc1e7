"""FedAT core: shared by every service; imports numpy, never TensorFlow."""
