"""Tiny offline things to train without a download (a sentiment dataset and tiny BERT, a tiny Llama,
NER rows), for the examples, the tests and the benchmarks."""
