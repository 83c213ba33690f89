"""The paper's primitives: input checks, the score registry, the Top-k event,
equal-count bins and the metrics of P(correct) predictions."""
