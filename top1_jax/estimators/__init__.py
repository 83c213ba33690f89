"""Estimators of P(correct | U) behind one protocol and registry."""
