"""What a role remembers: compression of its rounds into summaries, the prompt budget, tracked variables (the posts and rounds themselves are records)."""
