package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"tiermeshv1"
)

// placeLine is one job for `frontdoor place`: its priority level, its inputs' shapes and
// which of the plan's tiers have live workers.
type placeLine struct {
	Priority int       `json:"priority"`
	Shapes   [][]int64 `json:"shapes"`
	Alive    []bool    `json:"alive"`
}

// placeLines is `frontdoor place PLAN`: the door's choice of tier and stream on its own,
// for tests that compare it with the router's (tests/integration/test_door_placement.py).
// PLAN is a plan's JSON (core/direct_plan.py); each stdin line a placeLine; each stdout
// line {"tier": name, "stream": name}, or null where the router places the job.
func placeLines(planFile string) int {
	data, err := os.ReadFile(planFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	plan := &directPlan{}
	if err := json.Unmarshal(data, plan); err != nil || !plan.complete() {
		fmt.Fprintln(os.Stderr, "an incomplete or unreadable plan:", err)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var line placeLine
		if err := json.Unmarshal(in.Bytes(), &line); err != nil || len(line.Alive) != len(plan.Tiers) {
			fmt.Fprintln(os.Stderr, "a line without a liveness per tier:", err)
			return 2
		}
		job := &tiermeshv1.Job{}
		for _, shape := range line.Shapes {
			job.Inputs = append(job.Inputs, &tiermeshv1.Tensor{Shape: shape})
		}
		length := plan.lengthOf(job)
		on := chooseTier(plan.Tiers, costOf(job, length), line.Alive)
		if on < 0 || line.Priority < 1 || line.Priority > len(plan.Tiers[on].Streams) {
			_ = enc.Encode(nil)
			continue
		}
		tier := plan.Tiers[on]
		_ = enc.Encode(map[string]string{"tier": tier.Name, "stream": tier.Streams[line.Priority-1][plan.bucketOf(length)]})
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}
