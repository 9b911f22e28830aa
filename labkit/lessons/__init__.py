"""What the stage notebooks call around the student's code: the notebook helpers (notebook), ``lk.show`` (show, access,
draw, chosen_threads), what ``labkit lab`` checks first (lab) and stage 09's register-tile steps (tile_steps)."""
