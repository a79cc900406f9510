"""What runs on every rank: the model, the data, the train loop and its measurement."""
