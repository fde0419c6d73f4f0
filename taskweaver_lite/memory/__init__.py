"""What a role remembers: the conversation's posts and rounds, compression into summaries, the prompt budget, tracked variables."""
