"""What a partitioning reports: its rows, their collectives, and the views of them."""
