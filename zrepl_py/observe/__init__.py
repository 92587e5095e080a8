"""What runs leave behind for the people watching: ``runlog`` (every job action as a run row,
failure and recovery events, runs of dead processes ended ``interrupted``), ``events`` (the
operational event bus the alerts listen to), ``transfers`` (running transfers published as
small files for ``zbak status``), ``progress`` (rate and ETA of a byte stream, a progress bar
or log lines)."""
