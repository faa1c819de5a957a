package main

import (
	"encoding/json"
	"errors"
	"fmt"

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
	plan := &directPlan{}
	ready := func() error {
		if !plan.complete() {
			return errors.New("an incomplete plan")
		}
		return nil
	}
	return jsonLines(planFile, plan, ready, func(data []byte) (interface{}, error) {
		var line placeLine
		if err := json.Unmarshal(data, &line); err != nil {
			return nil, err
		}
		if len(line.Alive) != len(plan.Tiers) {
			return nil, fmt.Errorf("a line with %d livenesses for %d tiers", len(line.Alive), len(plan.Tiers))
		}
		job := &tiermeshv1.Job{}
		for _, shape := range line.Shapes {
			job.Inputs = append(job.Inputs, &tiermeshv1.Tensor{Shape: shape})
		}
		length := plan.lengthOf(job)
		on := chooseTier(plan.Tiers, costOf(job, length), line.Alive)
		if on < 0 || line.Priority < 1 || line.Priority > len(plan.Tiers[on].Streams) {
			return nil, nil
		}
		tier := plan.Tiers[on]
		return map[string]string{"tier": tier.Name, "stream": tier.Streams[line.Priority-1][plan.bucketOf(length)]}, nil
	})
}
