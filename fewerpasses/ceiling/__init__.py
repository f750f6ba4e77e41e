"""The perfect-draft ceiling: prompt lookup's loop and verify passes, drafting the answer's own
next tokens. It is the most any drafter from the text could give on this machine, model and
context: a labelled bound, the one row that sees the answer it is timed on."""
