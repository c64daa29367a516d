"""After a run: verify every input line is accounted for, export the training set, report on quality."""
