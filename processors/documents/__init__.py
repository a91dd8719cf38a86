"""Documents and inboxes: the database effects of processing, exactly once."""
