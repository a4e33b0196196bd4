"""Money: prices per GPU model, the cost of each finding and of idle time."""
