"""One definition of each rule every stage applies: raw values (rulebook) and exact metrics (metrics)."""
