"""``rlsdk view``: a local web page for run folders (runs, steps, samples, rewards, trajectories), read
while a run writes them and never written. :mod:`.server` serves it; :mod:`.runs` reads a folder."""
