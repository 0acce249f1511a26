# The scaling report as a PNG, drawn from the table jobs/bench_scaling.sh writes:
#   gnuplot -e "csv='runs/scaling/scaling.csv'; png='runs/scaling/scaling.png'; title='...'" jobs/scaling_plot.gp
# Left: samples/s against ranks for vqa-hpc and PyTorch DDP, with vqa-hpc's
# ideal (N x its smallest run). Right: vqa-hpc's step in ms split into its
# phases (stacked), with the measured step time as an outline; the part of the
# step outside the timed phases is the gap between the stack and the outline.
# CSV columns: 1 impl, 2 ranks, 3 samples/s, 4 step_ms, 5 efficiency,
# 6 ratio_vs_ddp, 7..12 data_wait h2d forward backward comm_exposed optimizer (ms).
if (!exists("csv")) csv = "runs/scaling/scaling.csv"
if (!exists("png")) png = "runs/scaling/scaling.png"
if (!exists("title")) title = "vqa-hpc scaling"

set terminal pngcairo size 1400,560 font "sans,11"
set output png
set datafile separator ","
set datafile missing "n/a"
set key bottom right
set grid ytics

is_impl(name) = strcol(1) eq name
# The smallest rank count's samples/s, per rank, for the ideal line.
stats csv using (is_impl("vqa-hpc") ? $2 : NaN) nooutput
first_ranks = STATS_min
stats csv using (is_impl("vqa-hpc") && $2 == first_ranks ? $3 : NaN) nooutput
per_rank = STATS_min / first_ranks
stats csv using 2 nooutput
max_ranks = STATS_max

set multiplot layout 1,2 title title
set title "throughput"
set xlabel "ranks"
set ylabel "samples/s"
set xrange [0.5:max_ranks + 0.5]
set xtics 1
set yrange [0:*]
plot csv using (is_impl("vqa-hpc") ? $2 : NaN):3 with linespoints lw 2 pt 7 title "vqa-hpc", \
     csv using (is_impl("pytorch-ddp") ? $2 : NaN):3 with linespoints lw 2 pt 5 title "PyTorch DDP (gloo)", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):3:(sprintf("%.2f", $5)) with labels offset 0,1 notitle, \
     [1:max_ranks] per_rank * x with lines dt 2 lc "gray" title "ideal (N x S_1)"

set title "vqa-hpc step breakdown (mean ms per step)"
set ylabel "ms per step"
set key outside right top
set style fill solid 0.8 border -1
set boxwidth 0.5
# Cumulative sums drawn from the largest down, so the boxes stack.
cum(n) = sum [i = 7:n] column(i)
plot csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(12)) with boxes title "optimizer", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(11)) with boxes title "comm exposed", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(10)) with boxes title "backward", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(9)) with boxes title "forward", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(8)) with boxes title "h2d", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):(cum(7)) with boxes title "data wait", \
     csv using (is_impl("vqa-hpc") ? $2 : NaN):4 with boxes fs empty lw 2 lc rgb "black" title "step (from samples/s)", \
     csv using (is_impl("pytorch-ddp") ? $2 : NaN):4 with points pt 5 ps 1.5 lc rgb "red" title "DDP step"
unset multiplot
