"""The loss at the model's head: the token-chunked output projection + cross entropy."""
