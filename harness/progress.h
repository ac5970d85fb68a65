// Progress lines of the long commands (fuzz cases, shrinking a failure, bench measurements,
// scripts/lib.sh's build steps): for a reader who is not watching a terminal (a log, CI, a Slurm
// job), at most one line per interval, so that a long step is never silent.
#pragma once

namespace ropekv {

// Seconds between two progress lines: 10, or the environment variable ROPEKV_PROGRESS_INTERVAL
// (a decimal number of seconds >= 0, e.g. 0.5; 0: a line every time one is due, for tests).
// arg_error naming the variable when it is set but not such a number.
double progress_interval_s();

// Says when the next progress line is due: once per interval.
class progress_ticker {
 public:
  progress_ticker();  // the interval of progress_interval_s()
  explicit progress_ticker(double interval_s);
  // True when the interval has passed since the last true (or since construction); the next
  // interval starts then.
  bool due();

 private:
  double interval_s_;
  double last_s_;  // steady-clock seconds of the last line (or of construction)
};

}  // namespace ropekv
