#!/bin/sh
# CPU cost of `top` (issue 5: under 2% of one CPU at the default 1 s refresh).
# usage: measure_top.sh BIN SECONDS [extra args before `top`]
# Runs BIN [extra] top -i 1 in a 200x50 tmux pane and reports the CPU time of the UI
# (main) thread and of the whole process over SECONDS, from /proc/<pid>/task/*/schedstat.
BIN=$1; SECS=$2; shift 2
S=measure-$$
tmux -L $S new-session -d -s m -x 200 -y 50 "$BIN $* top -i 1"
sleep 3
PID=$(tmux -L $S display-message -p -t m '#{pane_pid}')
ui0=$(cut -d' ' -f1 /proc/$PID/task/$PID/schedstat)
all0=$(cat /proc/$PID/task/*/schedstat | awk '{s+=$1} END {print s}')
sleep $SECS
ui1=$(cut -d' ' -f1 /proc/$PID/task/$PID/schedstat)
all1=$(cat /proc/$PID/task/*/schedstat | awk '{s+=$1} END {print s}')
tmux -L $S capture-pane -p -t m | head -4
tmux -L $S kill-server
awk -v u=$((ui1-ui0)) -v a=$((all1-all0)) -v s=$SECS 'BEGIN {
  printf "UI thread: %.3f%% of one CPU; whole process (incl. feed thread): %.3f%%\n", u/(s*1e7), a/(s*1e7) }'
