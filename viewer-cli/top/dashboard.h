// Dashboard: the curses view of `vramscope top` and `vramscope run --live`. It draws a TopModel
// (title, table, memory graph, NVTX ranges and top sites of the selected row, a status line) and
// turns keys into model changes. Drawing goes through curses' virtual screen (erase, draw,
// refresh), so only changed cells are sent: no flicker, fine over ssh. KEY_RESIZE (SIGWINCH,
// handled by ncurses) re-lays the screen out; 80x24 is the size the layout is made for, smaller
// terminals get fewer rows.
//
// Thread safety: none; curses is used from one thread. Errors: Start returns false (after
// printing why to stderr) when the terminal cannot be used.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "top/top_model.h"

namespace vramscope::cli::top {

enum class InputResult {
  kNone,     // no key arrived
  kChanged,  // a key changed what is shown
  kQuit,     // `q` (or Ctrl-D)
};

class Dashboard {
 public:
  // `source` is shown in the title ("collector 127.0.0.1:7411", "run ./train.py").
  explicit Dashboard(std::string source);
  ~Dashboard();  // Stop()
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // Takes the terminal (stdin, stdout). False, after printing why, when it cannot.
  bool Start();
  // Gives the terminal back; safe to call twice.
  void Stop();
  bool started() const { return started_; }

  // Waits up to `timeout_ms` (0 = do not wait) for one key and applies it to `model`.
  InputResult HandleInput(TopModel& model, int timeout_ms);
  // Draws the whole screen; `status`, when not empty, replaces the key help on the last line.
  void Draw(const TopModel& model, std::string_view status);

 private:
  void DrawTable(const TopModel& model, int top, int height, int width);
  void DrawGraph(const TopModel& model, int top, int height, int width);
  void DrawDetails(const TopModel& model, int top, int height, int width);
  void DrawHelp(int height, int width);

  std::string source_;
  bool started_ = false;
  bool unicode_ = false;
  bool colors_ = false;
  bool show_help_ = false;
  bool editing_filter_ = false;
  std::string filter_before_edit_;
  std::size_t scroll_ = 0;  // first table row on screen
  int table_height_ = 1;
};

}  // namespace vramscope::cli::top
