"""Inference engines behind one adapter interface; never imports `gateway`."""
