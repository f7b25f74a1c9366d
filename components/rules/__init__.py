"""One definition of each rule and fact every layer shares: raw values (rulebook, its cases in
rulebook_cases), exact metrics (metrics), names (names) and the TPU chips (chips). The bottom layer:
it imports nothing of the project, so the configuration, the contracts and every stage can."""
