"""What the controller does with the nodes of a job: a lost one, standbys, resize, migration, buddies, stragglers."""
