# One run's metrics as a PNG, from the table jobs/plot_run.sh writes:
# columns 1 epoch, 2 train loss, 3 test loss, 4 overall, 5 open, 6 closed (%),
# 7 samples/s, 8 best (1 on the epochs that set a new best overall).
if (!exists("table")) exit error "run_plot.gp: set table='FILE'"
if (!exists("png")) png = "run.png"
if (!exists("plot_title")) plot_title = "vqa_train run"

set terminal pngcairo size 1500,480 font "sans,11"
set output png
set datafile missing "nan"
set grid
set xlabel "epoch"
set key top right

# The best epoch: the last one that set a new best.
stats table using ($8 > 0 ? $1 : NaN) nooutput
best_epoch = STATS_records > 0 ? STATS_max : -1

set multiplot layout 1,3 title plot_title noenhanced
set title "loss"
set ylabel "BCE x K"
set yrange [0:*]
plot table using 1:2 with lines lw 2 title "train", \
     table using 1:3 with linespoints lw 2 pt 7 ps 0.6 title "test"

set title "test accuracy"
set ylabel "%"
set yrange [0:100]
set key bottom right
if (best_epoch >= 0) set arrow 1 from best_epoch, graph 0 to best_epoch, graph 1 nohead dt 2 lc "gray"
plot table using 1:4 with linespoints lw 2 pt 7 ps 0.6 title "overall", \
     table using 1:5 with lines lw 1.5 title "open", \
     table using 1:6 with lines lw 1.5 title "closed", \
     table using ($8 > 0 && $1 == best_epoch ? $1 : NaN):4:(sprintf("best %.1f%% (epoch %d)", $4, $1)) \
       with labels point pt 6 ps 2 offset 0,-1.5 notitle
unset arrow 1

set title "throughput"
set ylabel "samples/s (all ranks)"
set yrange [0:*]
set key top right
plot table using 1:7 with linespoints lw 2 pt 7 ps 0.6 title "samples/s"
unset multiplot
