"""Routing: filters, then weighted scorers, then one picker, over the fleet's live state."""
