"""What a user's own script imports (through the doors training.callbacks, training.hf_trainer,
training.torch_loop): OrchCallback for Lightning, OrchTrainerCallback for transformers.Trainer,
OrchLoop for plain PyTorch, and the job side of the contract the last two share."""
