"""Results for people: data frames for a notebook (frames) and matplotlib figures (plots)."""
