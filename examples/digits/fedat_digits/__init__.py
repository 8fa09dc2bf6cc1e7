"""FedAT example: scikit-learn's handwritten digits, split by class across clients (`fedat_digits.app:app`)."""
