"""The pool controller: turns each pool's desired_instances into placed sandbox records."""
