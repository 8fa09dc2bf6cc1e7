"""Worker and evaluator services: the only place TensorFlow is imported."""
