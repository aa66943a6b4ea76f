#pragma once
// Following a job's frames (docs/fan-in.md): which events to ask for next. The job's supervising
// agent numbers its events upward from 1 and sends at most kMaxFrameEvents a frame, the oldest
// first, so a client that holds many asks for those after the last that came until it has every
// one. Another agent that takes the job over, or the same one started again, numbers them anew:
// the numbers fall, and the client reads them from the first again. lockstepctl watch --fan-in and
// the app's agent workers follow frames by this one rule. A client that asks often (the app, ten
// times a second) names the frame it holds (heldUnixUs), and that frame comes again without its KPIs.

#include <cstdint>

#include "lockstep/protocol/types.h"

namespace lockstep {

struct FrameCursor {
  std::uint64_t eventsAfter = 0;  // what the next FrameRequest asks for
  std::int64_t heldUnixUs = 0;    // the moment of the newest frame whose KPIs came: the next one names it

  // Takes `frame`'s events into the cursor. False when its numbers fell below the cursor's: the
  // cursor starts again from 0, and events already seen may come again.
  bool take(const FrameReply& frame) {
    if (frame.lastEvent < eventsAfter) {
      eventsAfter = 0;
      heldUnixUs = 0;
      return false;
    }
    if (!frame.events.empty()) eventsAfter = frame.events.back().seq;
    if (!frame.kpis.empty()) heldUnixUs = frame.timeUnixUs;
    return true;
  }
  // Whether every event the frame's agent held came (else the next frame brings more).
  bool complete(const FrameReply& frame) const { return eventsAfter >= frame.lastEvent; }
};

}  // namespace lockstep
