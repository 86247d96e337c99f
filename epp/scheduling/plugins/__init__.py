"""Built-in scheduling plugins (filters, scorers, pickers), one concern per module."""
